"""Process plumbing shared by the services and the CLI: the embedded Redis server, logging,
free ports. Imports only the standard library, redis-py and the contract."""
