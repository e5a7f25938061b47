"""The URLs of the test process's Django (tests/django/conftest.py): the admin."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
