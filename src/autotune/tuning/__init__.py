"""One tuning's orchestration around the search: its trials' launchers and runner, stored answers, the
plan-only recommendation and the report's building; everything here needs a TuneContext (request/)."""
