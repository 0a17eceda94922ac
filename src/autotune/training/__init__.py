"""The user's training choices autotune keeps as given: optimizers, LoRA through peft, and their checks."""
