"""Step 4, search: walk the ladder with real trials, reason about speed, pick beyond noise, remember
answers in the results cache, and the plan-only recommendation.
"""
