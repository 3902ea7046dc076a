"""The `gateway` actor kind (its config model lives in `actors.gateway._config`)."""
