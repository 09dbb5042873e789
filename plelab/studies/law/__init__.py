"""The dead-zone law (docs/deadzone-law.md): the dP/H below which a PLE table goes unused or stops paying, fitted
on several widths, predicted for another, with an early-warning rule; `plelab params --suggest-ple` reads it."""
