"""Pure records and their canonical encoding. No I/O here."""
