"""ds_config dicts: built for a candidate, laid over the user's base config, loaded and filled as the
consumer (HF Trainer, accelerate) fills them, validated by DeepSpeed's parser, emitted with launch commands.
"""
