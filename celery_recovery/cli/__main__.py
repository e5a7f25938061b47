from celery_recovery.cli.main import main

main()
