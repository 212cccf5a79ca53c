"""The ``mirrorline`` command line (DESIGN §9). Each command is one small module here with ``add_arguments`` and
``run``; heavy imports (Spark, drivers) happen inside ``run`` so that ``--help`` is instant."""
