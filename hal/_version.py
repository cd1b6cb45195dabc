"""Version numbers of the distribution and of the backend API (SPI)."""

__version__ = "1.1.0"

#: Version of the backend SPI. A backend declares the version it was written
#: against; a different *major* version is refused at load time.
API_VERSION = (1, 1)
