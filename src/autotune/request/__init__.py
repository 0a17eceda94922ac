"""One validated tuning request and the context every entry point (plan, tune, hook, check) derives from
it: the request's rules, its keys, the base config's say, and the user's own training command.
"""
