"""What tests share: services, Kafka and Postgres helpers, processes, records and
assertions. Test modules import from here, never from each other."""
