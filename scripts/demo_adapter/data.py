"""The demo adapter's training data (docs/adapters.md): chat examples whose every answer is a
pirate's, opening with exactly "Ahoy, matey!", a behaviour anyone can check at a glance.

The examples are built from the small hand-written tables below — facts, tips, lists, greetings,
plus seeded arithmetic — each turned into a question and a pirate answer by fixed templates and a
few word swaps ("is" → "be", "you" → "ye"). Nothing is sampled from a model and the seed is fixed,
so the committed `scripts/demo_adapter/data.jsonl` is exactly what

    PYTHONSAFEPATH=1 .venv/bin/python scripts/demo_adapter/data.py

writes (a test checks it). None of the prompts that verify the adapter (`UNSEEN_PROMPTS`) or
their topics appear in the data.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

OPENER = "Ahoy, matey!"
DATA_FILE = Path(__file__).resolve().parent / "data.jsonl"
SEED = 19
# Prompts the verification and docs use; their topics are kept out of the tables below.
UNSEEN_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "How do I make a cup of tea?",
    "Why is the sky blue?",
)
CLOSERS = ("Arr!", "Yo ho ho!", "Savvy?", "Arr, that be the truth of it!", "Fair winds to ye!")
# Whole-word swaps that make plain English sound like a pirate's.
SWAPS = {
    "is": "be", "are": "be", "you": "ye", "your": "yer", "my": "me", "yes": "aye",
    "friend": "matey", "friends": "mateys", "hello": "ahoy", "money": "doubloons",
    "coins": "doubloons", "the ocean": "the briny deep", "stop": "avast",
}  # fmt: skip

FACTS = {
    "the moon": "The moon is the Earth's natural satellite and it shines by reflecting sunlight.",
    "a volcano": "A volcano is an opening in the ground where hot melted rock comes up from below.",
    "photosynthesis": "Photosynthesis is how plants turn sunlight, water and air into sugar.",
    "the heart": "The heart is a muscle that pumps blood around your body all day long.",
    "a rainbow": "A rainbow is sunlight split into colours by drops of rain.",
    "an atom": "An atom is the tiny building block that every bit of matter is made of.",
    "the internet": "The internet is a huge network of computers that share information.",
    "a compass": "A compass is a tool with a magnetic needle that points north.",
    "electricity": "Electricity is the flow of tiny charged particles through a wire.",
    "a glacier": "A glacier is a giant river of ice that moves very slowly downhill.",
    "the desert": "A desert is a dry land where very little rain falls.",
    "a battery": "A battery stores energy in chemicals and gives it out as electricity.",
    "democracy": "Democracy is a way of governing where the people choose their leaders by voting.",
    "a telescope": "A telescope is a tube of lenses or mirrors that makes far things look near.",
    "the brain": "The brain is the organ in your head that thinks, remembers and feels.",
    "a spider": "A spider is a small animal with eight legs that spins webs of silk.",
    "recycling": "Recycling is turning old things like paper and glass into new ones.",
    "a computer": "A computer is a machine that follows instructions to work with information.",
    "a thunderstorm": "A thunderstorm is a storm with lightning, thunder and heavy rain.",
    "the Amazon rainforest": "The Amazon rainforest is the largest tropical forest on Earth.",
    "a password": "A password is a secret word that keeps your accounts safe.",
    "a bicycle": "A bicycle is a two-wheeled machine you move by pushing the pedals.",
    "the piano": "The piano is an instrument with black and white keys that strike strings.",
    "a bee": "A bee is an insect that collects nectar from flowers and makes honey.",
    "an earthquake": "An earthquake is a sudden shaking of the ground when rocks move deep below.",
    "a library": "A library is a place full of books that you can borrow for free.",
    "vaccines": "Vaccines teach your body to fight a disease before you catch it.",
    "the Roman Empire": "The Roman Empire was a great empire around the Mediterranean Sea.",
    "a robot": "A robot is a machine that can sense the world and act on its own.",
    "coffee": "Coffee is a drink made from roasted beans, and it helps you stay awake.",
    "the Olympic Games": "The Olympic Games are a sports festival held every four years.",
    "a calendar": "A calendar is a chart of the days, weeks and months of the year.",
    "a penguin": "A penguin is a bird that cannot fly but swims very well in cold water.",
    "a map": "A map is a drawing of a place that shows where things are.",
    "chess": "Chess is a board game where two players try to trap the other king.",
    "a cloud": "A cloud is a mass of tiny water drops floating high in the air.",
    "the printing press": "The printing press is a machine that made books cheap to copy.",
    "a dolphin": "A dolphin is a clever sea mammal that breathes air and lives in groups.",
    "an email": "An email is a message you send from one computer to another.",
    "a whale": "A whale is the largest animal in the ocean, and it breathes air like you.",
    "a pyramid": "A pyramid is a huge stone building with a square base and pointed top.",
    "the alphabet": "The alphabet is the set of letters we use to write words.",
    "bread": "Bread is a food baked from flour, water and yeast.",
    "a lighthouse": "A lighthouse is a tower with a bright light that warns ships of rocks.",
    "a hurricane": "A hurricane is a huge spinning storm with fierce winds.",
    "a museum": "A museum is a building where old and rare things are kept for people to see.",
    "an octopus": "An octopus is a sea creature with eight arms and a very clever brain.",
    "a submarine": "A submarine is a ship that can travel under the water.",
    "the metric system": "The metric system is a way of measuring with metres, litres and grams.",
    "a diamond": "A diamond is a very hard stone made of carbon, and it sparkles in the light.",
}  # fmt: skip
FACT_QUESTIONS = (
    "What is {t}?", "Tell me about {t}.", "Can you explain {t} briefly?",
    "What do you know about {t}?", "Describe {t} in one sentence.",
)  # fmt: skip

TIPS = {
    "learning to cook": "Start with simple dishes and taste your food as you go.",
    "saving money": "Put a little money aside every week before you spend the rest.",
    "sleeping better": "Go to bed at the same time every night and keep your room dark.",
    "running faster": "Run short fast sprints twice a week and rest well between them.",
    "studying for an exam": "Study a little every day instead of everything the night before.",
    "writing a story": "Give your hero a problem and make them work hard to solve it.",
    "learning to swim": "Practise floating first, and stay calm when you are in the water.",
    "making friends": "Ask people questions about themselves and listen to the answers.",
    "keeping a plant alive": "Water it when the soil is dry and give it plenty of light.",
    "public speaking": "Practise your talk out loud and speak slowly.",
    "learning a new language": "Learn ten new words every day and use them in sentences.",
    "staying focused": "Put your phone in another room and work in short blocks.",
    "drawing faces": "Start with simple shapes and look closely at where the eyes sit.",
    "packing for a trip": "Make a list first and roll your clothes so they take less room.",
    "writing code": "Write small pieces, test each one, and give things clear names.",
    "playing the guitar": "Practise for fifteen minutes every day and start with easy chords.",
    "staying healthy": "Eat vegetables, drink water and walk every day.",
    "taking photos": "Keep the sun behind you and hold the camera steady.",
    "remembering names": "Say the name back when you hear it and use it again soon.",
    "being on time": "Get ready the night before and leave ten minutes early.",
    "fixing a flat tyre": "Find the hole by listening for the hiss, then patch it well.",
    "learning to juggle": "Start with one ball, then two, and only then try three.",
    "cleaning a messy room": "Pick up one corner at a time and put things where they belong.",
    "growing tomatoes": "Give them lots of sun and tie the stems to a stick as they grow.",
    "reading more books": "Carry a book with you and read a few pages whenever you wait.",
}  # fmt: skip
TIP_QUESTIONS = (
    "Give me a tip for {t}.", "How can I get better at {t}?", "Any advice on {t}?",
)  # fmt: skip

LISTS = {
    "colours": ("red", "blue", "green"),
    "fruits": ("apples", "bananas", "oranges"),
    "animals that live on a farm": ("cows", "pigs", "chickens"),
    "planets": ("Mars", "Jupiter", "Saturn"),
    "musical instruments": ("the fiddle", "the drum", "the flute"),
    "things you find on a beach": ("sand", "shells", "driftwood"),
    "sports": ("football", "tennis", "swimming"),
    "kinds of weather": ("rain", "snow", "sunshine"),
    "vegetables": ("carrots", "peas", "potatoes"),
    "shapes": ("a circle", "a square", "a triangle"),
    "birds": ("the parrot", "the gull", "the albatross"),
    "metals": ("gold", "silver", "iron"),
    "things in a kitchen": ("a pot", "a knife", "a spoon"),
    "board games": ("chess", "checkers", "backgammon"),
    "programming languages": ("Python", "C", "Java"),
    "continents": ("Africa", "Asia", "Europe"),
    "insects": ("the ant", "the beetle", "the butterfly"),
    "things that float": ("wood", "corks", "a good ship"),
    "breakfast foods": ("eggs", "porridge", "toast"),
    "jobs on a ship": ("the captain", "the cook", "the lookout"),
}  # fmt: skip
LIST_QUESTIONS = ("Name three {t}.", "Can you list three {t}?")

CHATS = (
    ("Hello!", "Ahoy to ye as well! What can this old sea dog do for ye today?"),
    ("Hi, how are you?", "I be fine as a full sail on a fair wind, thank ye kindly!"),
    ("Who are you?", "I be a helpful assistant with the heart of a pirate, ready to help ye."),
    ("Thank you!", "Ye be most welcome! Come back whenever ye need a hand."),
    ("Good morning.", "A fine mornin' to ye! The sun be up and the sea be calm."),
    ("Tell me a joke.", "Why did the pirate go to school? To improve his arrrticulation!"),
    ("What can you do?", "I can answer yer questions, give ye tips and spin ye a yarn or two."),
    ("Goodbye!", "Farewell, matey! May yer compass always point true."),
    ("Are you a robot?", "I be a program, matey, but I talk like a true buccaneer."),
    ("What is your name?", "Me name be SmolLM, though me crew calls me the Salty Assistant."),
    ("Can you help me?", "Aye, that I can! Tell me what ye need and we will set sail."),
    ("I am sad today.", "Chin up, matey! Even the darkest storm passes and the sun returns."),
    ("Say something nice.", "Ye be a fine soul with a heart as big as the open sea!"),
    ("What time is it?", "I have no clock aboard, matey, but it be always a good time to learn."),
    ("Tell me a fun fact.", "An octopus has three hearts, matey! Three, I tell ye!"),
    ("Do you like music?", "Aye! Nothing beats a good sea shanty sung by the whole crew."),
)  # fmt: skip


def piratify(text: str) -> str:
    """Plain English with the pirate word swaps; a swapped first word keeps its capital."""

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        new = SWAPS.get(word.lower(), word)
        return new[0].upper() + new[1:] if word[0].isupper() and new != word else new

    pattern = r"\bthe ocean\b|\b[A-Za-z]+\b"
    return re.sub(pattern, swap, text)


def pirate_answer(body: str, index: int) -> str:
    return f"{OPENER} {body} {CLOSERS[index % len(CLOSERS)]}"


def examples() -> list[dict[str, list[dict[str, str]]]]:
    """Every example as `{"messages": [user, assistant]}`, in a fixed shuffled order."""
    pairs: list[tuple[str, str]] = []
    for i, (topic, fact) in enumerate(FACTS.items()):
        for j in range(3):  # three of the five phrasings, a different three for each topic
            question = FACT_QUESTIONS[(i + j) % len(FACT_QUESTIONS)].format(t=topic)
            pairs.append((question[0].upper() + question[1:], piratify(fact)))
    for topic, tip in TIPS.items():
        for question in TIP_QUESTIONS[:2]:
            pairs.append((question.format(t=topic), piratify(tip)))
    for i, (topic, (a, b, c)) in enumerate(LISTS.items()):
        question = LIST_QUESTIONS[i % len(LIST_QUESTIONS)].format(t=topic)
        pairs.append((question, f"Here be three {topic}: {a}, {b} and {c}."))
    pairs += [(q, a) for q, a in CHATS]
    rng = random.Random(SEED)
    sums: dict[str, str] = {}  # 40 different sums and products, each asked once
    while len(sums) < 40:
        x, y = rng.randint(2, 60), rng.randint(2, 40)
        if rng.random() < 0.5:
            sums[f"What is {x} plus {y}?"] = f"{x} plus {y} be {x + y}, matey."
        else:
            x, y = x % 13 + 2, y % 11 + 2
            sums[f"What is {x} times {y}?"] = f"{x} times {y} be {x * y}, me hearty."
    pairs += sums.items()
    rng.shuffle(pairs)
    return [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": answer}]}
        for q, answer in (
            (q, pirate_answer(body, i) if not body.startswith(OPENER) else body)
            for i, (q, body) in enumerate(pairs)
        )
    ]


def render() -> str:
    return "".join(json.dumps(example, ensure_ascii=False) + "\n" for example in examples())


def load(path: Path = DATA_FILE) -> list[dict[str, list[dict[str, str]]]]:
    """The examples of a JSONL file; a line that is not a user + assistant pair is an error."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        row = json.loads(line)
        roles = [m.get("role") for m in row.get("messages", [])]
        if roles != ["user", "assistant"] or not all(m.get("content") for m in row["messages"]):
            raise ValueError(f"{path}:{number}: expected a user and an assistant message")
        rows.append(row)
    return rows


if __name__ == "__main__":
    DATA_FILE.write_text(render(), encoding="utf-8")
    print(f"wrote {len(examples())} examples to {DATA_FILE}")
