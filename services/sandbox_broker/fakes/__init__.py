"""Stand-ins for services that cannot run on this machine, written from their published APIs."""
