"""The rank side of a trial: the worker each rank runs, the training steps it times and the memory it
measures; the only code under trial/ that imports torch or DeepSpeed. The map: trial/README.md."""
