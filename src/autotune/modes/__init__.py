"""The modern memory modes beyond the classic ladder, in one home: where each applies, how the search
sees them, how a plan summarises them, and how a user's config names one.
"""
