"""The field's environments as platform tasks: one module per source (docs/environments.md).

Each adapter reads a source's own definition (its file format, field names and reward semantics)
and turns it into the contract's requests: ``swebench``, ``swegym``, ``swesmith`` and ``r2egym``
map dataset rows onto the SWE route's instances (``swe_files`` reads the files); ``harbor`` reads
Harbor task directories. Adapters import the contract only; they run on the client side (the
``rollout tasks import`` command), so the services never depend on them. The one exception is
the stepping side of the package adapters (``skyrl_gym``): a worker loads it by name
(``services.protocol.environments.ENV_ADAPTERS``) to step an ``env`` agent's environment.
"""
