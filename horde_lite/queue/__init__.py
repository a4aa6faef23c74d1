"""The queue: the one eligibility rule (its SQL clause and Python check), the index a pop walks, each
process's copy the wait estimate reads, and the estimate."""
