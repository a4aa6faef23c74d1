"""Jobs: the pop that hands them out, their leases, progress posts, submits and their settlement, and
what a job's output may hold."""
