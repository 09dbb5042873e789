"""The dead-zone study (docs/deadzone-study.md): does the loss plateau over small dP, then drop? Its report is also
the one every sweep no other study claims gets."""
