"""The `joiner` actor kind (its config model lives in `actors.joiner._config`)."""
