"""The shop's rules."""

RULES = [
    "Authenticate the user by email before acting on their orders.",
    "Only pending orders can be cancelled or have their address changed.",
]
