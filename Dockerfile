# One image for every DeFL process: the node's web server, its Celery worker and its agent
# (mariadb-client: `manage.py node backup` dumps a MariaDB database with mysqldump).
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEFL_DATA_DIR=/data
RUN apt-get update \
    && apt-get install -y --no-install-recommends libmariadb-dev mariadb-client pkg-config gcc nodejs npm \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# The CPU build of torch first, from PyTorch's CPU index, so nothing pulls a CUDA build.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY requirements.txt ./
RUN pip install -r requirements.txt
COPY . .
RUN mkdir -p /data
EXPOSE 8000
CMD ["gunicorn", "backend.wsgi", "-k", "gthread", "--threads", "8", "-b", "0.0.0.0:8000"]
