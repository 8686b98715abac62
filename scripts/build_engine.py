"""Build a TensorRT-LLM engine from a Hugging Face checkpoint for TritonBox's trtllm flavour.

Runs inside NVIDIA's TensorRT-LLM container of the serving image's TensorRT-LLM version (0.20.0
for nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3); it needs only the standard library and
huggingface_hub, both there. From the repository root (README, "Building a TensorRT-LLM engine"):

    docker run --rm --gpus all --ipc=host --ulimit memlock=-1 --ulimit stack=67108864 \
      --env-file .env -v "$PWD:/work" -w /work nvcr.io/nvidia/tensorrt-llm/release:0.20.0 \
      python3 scripts/build_engine.py --model google/gemma-7b-it --preset int4_awq \
        --kv-cache int8 --output models/gemma-7b-it-int4-awq

Steps: fetch the checkpoint (a Hugging Face id, HF_TOKEN for gated ones, or a local folder) ->
`examples/quantization/quantize.py` converts and quantises it (one preset) -> `trtllm-build` with
what in-flight batching needs (GPT-attention and GEMM plugins, paged KV cache, packed input,
context FMHA), the LoRA plugin unless MAX_LORA_RANK is 0, and the limits of `.env`
(MAX_BATCH_SIZE, MAX_INPUT_LEN, MAX_OUTPUT_LEN, TENSOR_PARALLELISM; flags override) -> the
tokenizer copied next to the engine, so that ENGINE_REPOSITORY alone serves it, with xgrammar's
tokenizer info for guided decoding (structured output) -> optionally, an upload to a Hugging Face
repository.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path("/app/tensorrt_llm/examples")
# The serving image's TensorRT-LLM: an engine loads only in the version that built it (the
# serving side checks config.json's `version`; tests keep this equal to engine_check's).
TRTLLM_VERSION = "0.20.0"
BUILD_IMAGE = f"nvcr.io/nvidia/tensorrt-llm/release:{TRTLLM_VERSION}"
# trtllm-build's own default for --max_num_tokens (BuildConfig.max_num_tokens in 0.20).
TRTLLM_MAX_NUM_TOKENS = 8192
# Guided decoding's tokenizer info, written next to the engine as TensorRT-LLM's own
# examples/generate_xgrammar_tokenizer_info.py writes it (the renderer turns guided decoding on
# when it is there; tests keep the name equal to engine_check's).
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"
# The same defaults as TritonSettings (a test keeps them equal); .env usually sets them.
DEFAULTS = {"MAX_BATCH_SIZE": 16, "MAX_INPUT_LEN": 2048, "MAX_OUTPUT_LEN": 1024}
DEFAULTS |= {"MAX_LORA_RANK": 64}
# The LoRA plugin on every Llama projection (LoraManager.LORA_MODULE_IDS names; HF q_proj k_proj
# v_proj o_proj gate_proj up_proj down_proj: gate_proj is mlp_h_to_4h, up_proj is mlp_gate).
LORA_TARGET_MODULES: tuple[str, ...] = ("attn_q", "attn_k", "attn_v", "attn_dense")
LORA_TARGET_MODULES += ("mlp_h_to_4h", "mlp_gate", "mlp_4h_to_h")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True)
class Preset:
    dtype: str  # the unquantised parts (embeddings, lm_head, activations of weight-only)
    qformat: str  # quantize.py's --qformat
    meaning: str
    gemm_plugin: bool = True  # FP8 GEMMs run faster without the plugin


PRESETS = {
    "fp16": Preset("float16", "full_prec", "FP16, no quantisation"),
    "bf16": Preset("bfloat16", "full_prec", "BF16, no quantisation"),
    "int8_wo": Preset("float16", "int8_wo", "INT8 weight-only (activations FP16)"),
    "int4_wo": Preset("float16", "int4_wo", "INT4 weight-only (activations FP16)"),
    "int4_awq": Preset("float16", "int4_awq", "INT4 weights, AWQ (activation-aware) calibration"),
    "w4a8_awq": Preset("float16", "w4a8_awq", "INT4 AWQ weights, FP8 activations (Ada/Hopper)"),
    "fp8": Preset("float16", "fp8", "FP8 weights and activations (Ada/Hopper)", gemm_plugin=False),
    "int8_sq": Preset("float16", "int8_sq", "SmoothQuant: INT8 weights and activations"),
}


def _env_int(key: str) -> int:
    return int(os.environ.get(key) or DEFAULTS.get(key, 1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face id or local checkpoint dir")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="fp16")
    parser.add_argument("--kv-cache", choices=["int8", "fp8"], help="quantise the KV cache too")
    parser.add_argument("--output", type=Path, required=True, help="the engine folder to write")
    parser.add_argument("--work-dir", type=Path, help="checkpoint scratch (default: OUTPUT.ckpt)")
    parser.add_argument("--max-batch-size", type=int, default=_env_int("MAX_BATCH_SIZE"))
    parser.add_argument("--max-input-len", type=int, default=_env_int("MAX_INPUT_LEN"))
    parser.add_argument("--max-output-len", type=int, default=_env_int("MAX_OUTPUT_LEN"))
    parser.add_argument("--tp", type=int, default=_env_int("TENSOR_PARALLELISM"))
    parser.add_argument(
        "--max-lora-rank",
        type=int,
        default=_env_int("MAX_LORA_RANK"),
        help="largest LoRA adapter rank the engine serves (MAX_LORA_RANK; 0 = no LoRA plugin)",
    )
    parser.add_argument(
        "--gather-context-logits",
        action="store_true",
        help="keep every prompt position's logits (trtllm-build --gather_context_logits): "
        "needed for the api's `echo` with `logprobs`; costs vocab x prompt floats per request",
    )
    parser.add_argument(
        "--max-num-tokens",
        type=int,
        help="tokens per engine step (trtllm-build; default 8192, raised to --max-input-len: "
        "TritonBox serves without chunked context, so a whole prompt must fit one step)",
    )
    parser.add_argument("--calib-size", type=int, default=512, help="calibration samples")
    parser.add_argument("--calib-dataset", help="quantize.py's --calib_dataset (default theirs)")
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="TensorRT-LLM examples")
    parser.add_argument("--upload", metavar="ORG/NAME", help="push the engine to this HF repo")
    parser.add_argument("--public", action="store_true", help="create the upload repo public")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.max_lora_rank < 0:
        parser.error(f"--max-lora-rank {args.max_lora_rank}: 0 (no adapters) or more")
    if args.max_num_tokens is not None and args.max_num_tokens < args.max_input_len:
        parser.error(
            f"--max-num-tokens {args.max_num_tokens} is less than --max-input-len "
            f"{args.max_input_len}: without chunked context a prompt must fit one engine step"
        )
    return args


def max_num_tokens(args: argparse.Namespace) -> int:
    return args.max_num_tokens or max(TRTLLM_MAX_NUM_TOKENS, args.max_input_len)


def quantize_command(args: argparse.Namespace, model_dir: Path, checkpoint: Path) -> list[str]:
    preset = PRESETS[args.preset]
    command = [
        sys.executable,
        str(args.examples / "quantization" / "quantize.py"),
        f"--model_dir={model_dir}",
        f"--dtype={preset.dtype}",
        f"--qformat={preset.qformat}",
        f"--tp_size={args.tp}",
        f"--calib_size={args.calib_size}",
        f"--output_dir={checkpoint}",
    ]
    if args.kv_cache:
        command.append(f"--kv_cache_dtype={args.kv_cache}")
    if args.calib_dataset:
        command.append(f"--calib_dataset={args.calib_dataset}")
    return command


def build_command(args: argparse.Namespace, checkpoint: Path) -> list[str]:
    preset = PRESETS[args.preset]
    command = [
        "trtllm-build",
        f"--checkpoint_dir={checkpoint}",
        f"--output_dir={args.output}",
        f"--max_batch_size={args.max_batch_size}",
        f"--max_input_len={args.max_input_len}",
        # One request's prompt plus its answer: what MAX_INPUT_LEN + MAX_OUTPUT_LEN must fit.
        f"--max_seq_len={args.max_input_len + args.max_output_len}",
        "--max_beam_width=1",
        f"--max_num_tokens={max_num_tokens(args)}",
        # In-flight batching (the backend's inflight_fused_batching) needs these three;
        # --kv_cache_type replaces 0.20's deprecated --paged_kv_cache.
        "--gpt_attention_plugin=auto",
        "--kv_cache_type=paged",
        "--remove_input_padding=enable",
        "--context_fmha=enable",
        f"--workers={args.tp}",
    ]
    if preset.gemm_plugin:
        command.append("--gemm_plugin=auto")
    if args.gather_context_logits:
        command.append("--gather_context_logits")
    command.append(f"--use_paged_context_fmha={'enable' if paged_context(args) else 'disable'}")
    if args.max_lora_rank > 0:
        # Adapters are sent with requests (lora_task_id/lora_weights/lora_config), so no
        # --lora_dir: the plugin in the model's dtype, its workspace sized for the largest rank.
        command += [
            f"--lora_plugin={preset.dtype}",
            f"--max_lora_rank={args.max_lora_rank}",
            "--lora_target_modules",
            *LORA_TARGET_MODULES,
        ]
    return command


def paged_context(args: argparse.Namespace) -> bool:
    """Paged context FMHA makes KV-cache reuse (shared system prompts) and chunked context
    possible, but TensorRT-LLM's build() refuses it with an INT8 KV cache ("Paged Context FMHA
    doesn't work with int8 kv cache") and with an FP8 KV cache outside the FP8 preset ("FP8
    Paged Context FMHA only works with fp8 quantization workflow"). Always passed explicitly:
    0.20 turns it on by default."""
    return args.kv_cache is None or (args.kv_cache == "fp8" and args.preset == "fp8")


def check_container() -> str | None:
    """Why this container cannot build for the serving image, or None when it can."""
    from importlib import metadata

    try:
        version = metadata.version("tensorrt_llm")
    except metadata.PackageNotFoundError:
        return f"TensorRT-LLM is not installed here: run this script in {BUILD_IMAGE}"
    if version != TRTLLM_VERSION:
        return (
            f"this container has TensorRT-LLM {version}, the serving image runs "
            f"{TRTLLM_VERSION} and loads only engines of its own version: run in {BUILD_IMAGE}"
        )
    return None


def fetch_checkpoint(model: str) -> Path:
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    # Only the weights quantize.py reads; original/*.pth and GGUF copies can double the download.
    ignore = ["*.pth", "*.gguf", "original/*", "*.msgpack", "*.h5", "*.onnx"]
    token = os.environ.get("HF_TOKEN") or None
    return Path(snapshot_download(model, ignore_patterns=ignore, token=token))


def copy_tokenizer(model_dir: Path, engine_dir: Path) -> list[str]:
    copied = [name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    for name in copied:
        shutil.copy2(model_dir / name, engine_dir / name)
    return copied


def write_xgrammar_tokenizer_info(model_dir: Path, engine_dir: Path) -> Path:
    """What TensorRT-LLM 0.20's examples/generate_xgrammar_tokenizer_info.py writes: its
    `_xgrammar_tokenizer_info` (encoded vocabulary, tokenizer JSON, stop ids) of the checkpoint's
    tokenizer, read by the backend's `xgrammar_tokenizer_info_path`."""
    from tensorrt_llm.llmapi.tokenizer import _xgrammar_tokenizer_info
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    path = engine_dir / XGRAMMAR_TOKENIZER_INFO
    path.write_text(json.dumps(_xgrammar_tokenizer_info(tokenizer)))
    return path


def upload(engine_dir: Path, repo_id: str, *, private: bool) -> None:
    from huggingface_hub import HfApi

    api = HfApi(token=os.environ.get("HF_TOKEN") or None)
    api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(
        folder_path=str(engine_dir), repo_id=repo_id, commit_message="TensorRT-LLM engine"
    )
    print(f"uploaded to https://huggingface.co/{repo_id}: set ENGINE_REPOSITORY={repo_id}")


def run(command: list[str]) -> None:
    print("+", shlex.join(command), flush=True)
    subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    checkpoint = args.work_dir or args.output.with_name(args.output.name + ".ckpt")
    if args.dry_run:
        print(shlex.join(quantize_command(args, Path(args.model), checkpoint)))
        print(shlex.join(build_command(args, checkpoint)))
        return 0
    problem = check_container()
    if problem:
        print(f"build_engine: {problem}", file=sys.stderr)
        return 1
    model_dir = fetch_checkpoint(args.model)
    try:
        run(quantize_command(args, model_dir, checkpoint))
        run(build_command(args, checkpoint))
    except subprocess.CalledProcessError as error:
        print(f"build_engine: {error}", file=sys.stderr)
        return 1
    copied = copy_tokenizer(model_dir, args.output)
    write_xgrammar_tokenizer_info(model_dir, args.output)
    record = {
        "model": args.model,
        "preset": args.preset,
        "kv_cache": args.kv_cache,
        "max_batch_size": args.max_batch_size,
        "max_input_len": args.max_input_len,
        "max_output_len": args.max_output_len,
        "tensor_parallelism": args.tp,
        "max_lora_rank": args.max_lora_rank,
        "max_num_tokens": max_num_tokens(args),
        "tensorrt_llm": TRTLLM_VERSION,
        "tokenizer_files": copied,
        "xgrammar_tokenizer_info": XGRAMMAR_TOKENIZER_INFO,
    }
    (args.output / "tritonbox-build.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"engine in {args.output}: set ENGINE_REPOSITORY to it, TENSOR_PARALLELISM={args.tp}")
    if args.upload:
        upload(args.output, args.upload, private=not args.public)
    return 0


if __name__ == "__main__":
    sys.exit(main())
