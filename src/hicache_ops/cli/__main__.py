from hicache_ops.cli.main import run

run()
