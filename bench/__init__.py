"""`make bench`: this engine against PING/EVALSHA floors, DRF's throttles and django-ratelimit, in one run."""
