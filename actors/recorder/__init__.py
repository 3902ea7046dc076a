"""The `recorder` actor kind (its config model lives in `actors.recorder._config`)."""
