"""What operators run and read: the policy in force across processes, the horde's figures and the
scrape-time gauges."""
