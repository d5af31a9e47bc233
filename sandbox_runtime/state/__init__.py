"""The runtime's state: its typed records (:mod:`.database`), kept by an engine (:mod:`.engine`: the embedded
SQLite file, :mod:`.sqlite`, or a PostgreSQL server several replicas share, :mod:`.postgresql`; which one a state
directory uses: :mod:`.location`), its schema and migrations (:mod:`.schema`), the leases and holds of the live
processes that share it (:mod:`.leases`), the claims on call ids (:mod:`.claims`), MCP tasks (:mod:`.tasks`),
named locks across processes (:mod:`.locks`), the move from SQLite to PostgreSQL (:mod:`.migration`), and its own
records (:mod:`.records`)."""
