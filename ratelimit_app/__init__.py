"""Rate limits for Django, configured as data and enforced in one Redis round trip."""
