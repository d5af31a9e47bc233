"""The ``sandbox-runtime`` command: the subcommands (:mod:`.main`), ``serve`` (:mod:`.serve`), and the demo with
its sample data (:mod:`.demo`, :mod:`.sample_data`)."""
