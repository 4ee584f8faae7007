"""ASGI entry point of the demo site (e.g. `uvicorn project.asgi:application`): async views stay async."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

application = get_asgi_application()
