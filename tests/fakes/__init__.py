"""Test fakes, one module per kind of real part they stand in for; tests and benchmarks/gpu_sim import them here.

- `machines`: the trial runner the search is given (`run(candidate)`) and the search's memory model.
- `launchers`: trial launchers for tune() (`run(spec)`), and the GPU kit's `run_trial`.
- `devices`: NVML, torch.cuda's caching allocator, DeepNVMe's aio handle.
- `hook`: tune() as the hook calls it.
- `torch_errors`: the exceptions torch raises when a trial fails, without importing torch.

And the builders several test modules share (a test module never imports from another: tests/test_code_shape.py):
- `models`: model summaries and GPU targets built by hand (no transformers); `activations`: MemTracker's activation
  peak of a real forward/backward (imports torch).
- `reports`: the golden reports as typed values; `requests`: a small real tuning request.
- `trials`: real tiny-gpt2 trials on the CPU backend (spec, process marks, the ops fixture).
- `searches`: searches over the fake machines, built one way.
- `hook` also holds the hook's request, a simulated SLURM job's environment and its launcher choice.

The rule they follow: a fake must not encode the beliefs of the code it tests (the search's memory and speed models,
the tuner's decisions), or a test would pass because the two agree. Each docstring says what the fake stands in
for, what it deliberately does not model, and where a fake shares a belief on purpose, why.

Importable as `tests.fakes` wherever the repository root is on sys.path: pytest run from the root
(`python3 -m pytest`), and the benchmarks that use them (they put the root on sys.path themselves).
"""
