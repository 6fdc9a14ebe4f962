"""Language-model helpers: a synthetic arithmetic task, a tiny offline tokenizer."""
