"""``specdec`` subcommands, one per module: each defines ``NAME``, ``add_parser(sub)`` and ``run(args)``."""
