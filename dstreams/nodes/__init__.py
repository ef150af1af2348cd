"""One module per operator family; each node implements the contract in ``dstreams.node``."""
