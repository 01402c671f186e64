//! slurmrestd client.
