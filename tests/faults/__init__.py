"""The fault suite: the limiter under faults made real, on real servers (Redis stopped, paused,
restarted, its connections killed; a cluster resharding; a database away or refusing writes; workers
killed; clients leaving), each test_*.py file one kind of fault and its module docstring the promises
it keeps. The other modules are the sites, settings and servers those tests start (*_site.py,
*_settings.py, code_*.py, slow_wsgi.py) and fresh.py's fresh databases and processes."""
