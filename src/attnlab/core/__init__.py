"""The ground floor: errors, atomic file writes, the validated-dataclass schema, process settings.

Nothing here knows about models, data or runs; every other package may import it.
"""
