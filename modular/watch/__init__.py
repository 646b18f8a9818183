"""Watching and stopping one pipeline call: its step callbacks, interrupt flag, cancel, progress events and
previews (``watch.py``), the values it reports and obeys (``events.py``), and the check of the keywords that
ask for them (``keywords.py``).

May import `modular.errors` and `modular.framework`; the pipeline and the services (batch jobs, serving) use it.
"""
