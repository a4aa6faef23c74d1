"""Requests: admission (the allowance, the price, the decision), their lists and chat rules, and their
status and cancellation."""
