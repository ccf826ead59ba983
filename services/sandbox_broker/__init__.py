"""The sandbox broker: leases sandboxes from a backend (local bubblewrap namespaces, the Docker
Engine API, E2B) with warm pools, TTL leases in Redis, admission control and an error taxonomy
that says which failures are the infrastructure's."""
