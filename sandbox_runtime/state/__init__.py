"""The runtime's state: the embedded SQLite database (:mod:`.database`, its schema and migrations in
:mod:`.schema`), the leases and holds of the live processes that share it (:mod:`.leases`), and its own records
(:mod:`.records`)."""
