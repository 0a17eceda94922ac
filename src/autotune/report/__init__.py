"""The tuning report: the typed value (`data`), its markdown and plot, the pick's summary lines and the
assumptions written beside the config.
"""
