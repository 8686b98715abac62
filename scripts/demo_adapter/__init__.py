"""The demo LoRA adapter: its training data (data.py writes data.jsonl), training and check."""
