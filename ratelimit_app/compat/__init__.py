"""Drop-in replacements for DRF's throttles (compat.drf) and django-ratelimit (compat.django_ratelimit):
the same API and settings, decided exactly by ratelimit_app's engine, each rate a policy in the admin."""
