"""Step 4, search: walk the ladder with real trials, reason about speed, pick beyond noise, remember answers in
the results cache. `walk.Search` is the entry point (see src/autotune/README.md for the modules)."""
