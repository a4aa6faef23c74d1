"""`horde-lite demo`: a server, a simulated fleet and a client load in one command, shown live."""
