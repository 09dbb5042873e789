"""The dead-zone law at more tokens (docs/deadzone-law.md, "Tokens"): does PLE's gain at small dP shrink, hold or
grow with training? One sweep crossing dP with several training lengths, read as gain against tokens."""
