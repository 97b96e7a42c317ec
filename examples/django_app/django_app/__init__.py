"""An example Django project limited by moderato (see docs/django.md).

Run it from examples/django_app/::

    python manage.py runserver                        # development
    gunicorn django_app.wsgi -w 4                     # WSGI, four sync workers
    uvicorn django_app.asgi:application --workers 2   # ASGI, async views on the loop

The backend: MODERATO_REDIS_URL, else the Redis on localhost:6379 if one
answers, else memory:// (examples/backend_choice.py). Every worker shares one
quota only on Redis.
"""
