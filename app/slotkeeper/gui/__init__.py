"""The PySide6 desktop shell over slotkeeper.core."""
