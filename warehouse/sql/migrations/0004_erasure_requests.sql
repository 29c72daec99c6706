-- An erasure's request id (issue 68, B): the caller's own id for one request, e.g.
-- the Airflow run that asked for it. A rerun under the same id resumes the erasure
-- from the last step it completed instead of starting another one. Not personal
-- data: it names the request, never the customer.
ALTER TABLE control.erasures
    ADD COLUMN request_id text UNIQUE CHECK (request_id ~ '^[A-Za-z0-9_.:+-]{1,250}$');
