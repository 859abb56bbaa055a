"""The command library: one package or module per hicache command group; cli/ renders them."""
