import pytest

from warehouse.base.settings import SettingsError, load

CLUSTER_ENV = {
    "REGAUGE_PROFILE": "cluster",
    "REGAUGE_SPARK_MASTER": "spark://spark-master:7077",
    "REGAUGE_KAFKA_BOOTSTRAP": "b1:9092,b2:9092",
    "REGAUGE_LAKE_ROOT": "s3a://lake/regauge",
    "REGAUGE_TRINO_HOST": "trino.internal",
    "REGAUGE_POSTGRES_HOST": "pg.internal",
}


def test_local_profile_is_the_default():
    s = load({})
    assert s.profile == "local"
    assert s.spark_master == "local[2]"
    assert s.kafka_bootstrap == "127.0.0.1:9092"
    assert s.trino_url == "http://127.0.0.1:8080"
    assert s.spark_driver_memory == "4g"
    assert s.view_host_memory == "3g"
    assert s.lake_root.endswith("warehouse/data/lake")
    assert s.lake_is_local


def test_cluster_profile_takes_hosts_from_the_environment():
    s = load(CLUSTER_ENV)
    assert (s.profile, s.spark_master, s.lake_root) == (
        "cluster",
        "spark://spark-master:7077",
        "s3a://lake/regauge",
    )
    assert s.kafka_bootstrap == "b1:9092,b2:9092"
    assert s.trino_host == "trino.internal"
    assert not s.lake_is_local


def test_cluster_profile_names_every_missing_variable():
    with pytest.raises(SettingsError) as err:
        load({"REGAUGE_PROFILE": "cluster", "REGAUGE_SPARK_MASTER": "spark://x:7077"})
    message = str(err.value)
    for var in ("REGAUGE_KAFKA_BOOTSTRAP", "REGAUGE_LAKE_ROOT", "REGAUGE_TRINO_HOST"):
        assert var in message
    assert "REGAUGE_SPARK_MASTER" not in message


def test_single_values_can_be_overridden():
    s = load({"REGAUGE_TRINO_PORT": "18080", "REGAUGE_KAFKA_PARTITIONS": "8"})
    assert s.trino_port == 18080
    assert s.kafka_partitions == 8


def test_a_bad_override_is_refused_with_its_variable_name():
    with pytest.raises(SettingsError, match="REGAUGE_TRINO_PORT='eighty'"):
        load({"REGAUGE_TRINO_PORT": "eighty"})


def test_an_unknown_profile_is_refused():
    with pytest.raises(SettingsError, match="expected one of local, cluster"):
        load({"REGAUGE_PROFILE": "prod"})


def test_a_password_for_trino_needs_https():
    with pytest.raises(SettingsError, match="needs REGAUGE_TRINO_SCHEME=https"):
        load({"REGAUGE_TRINO_PASSWORD": "pw"})
    with pytest.raises(SettingsError, match="http or https"):
        load({"REGAUGE_TRINO_SCHEME": "ftp"})
    s = load({"REGAUGE_TRINO_PASSWORD": "pw", "REGAUGE_TRINO_SCHEME": "https"})
    assert s.trino_url == "https://127.0.0.1:8080" and s.trino_password == "pw"


def test_an_airflow_of_ones_own_is_reached_by_url_and_login():
    assert load({}).airflow_url == "http://127.0.0.1:8081"
    s = load(
        {
            "REGAUGE_AIRFLOW_URL": "https://airflow.example.internal/",
            "REGAUGE_AIRFLOW_USER": "regauge",
            "REGAUGE_AIRFLOW_PASSWORD": "pw",
        }
    )
    assert (s.airflow_url, s.airflow_user, s.airflow_password) == (
        "https://airflow.example.internal",
        "regauge",
        "pw",
    )


def test_s3_change_detection_reaches_s3a_and_a_wrong_mode_is_refused(
    monkeypatch: pytest.MonkeyPatch,
):
    from spark_jobs.engine import session
    from spark_jobs.engine.session import _object_store_conf

    # The jars themselves come from `regauge cluster fetch`, which a machine that
    # never ran the cluster has not done: this is about the settings only.
    monkeypatch.setattr(session.jvm, "spark_s3_jars", lambda s: ["/jars/hadoop-aws.jar"])
    lake = {"REGAUGE_LAKE_ROOT": "s3a://bucket/lake"}
    assert _object_store_conf(load(lake))["spark.hadoop.fs.s3a.change.detection.mode"] == "server"
    relaxed = load({**lake, "REGAUGE_S3_CHANGE_DETECTION": "none"})
    conf = _object_store_conf(relaxed)
    assert conf["spark.hadoop.fs.s3a.change.detection.mode"] == "none"
    assert conf["spark.hadoop.fs.s3a.change.detection.version.required"] == "false"
    with pytest.raises(SettingsError, match="REGAUGE_S3_CHANGE_DETECTION='off'"):
        load({"REGAUGE_S3_CHANGE_DETECTION": "off"})


def test_the_local_postgres_password_is_made_per_state_folder_and_kept_owner_only(tmp_path):
    """Issue 68, A.1: the local profile shipped the password `regauge`, so every local
    account could log in over 127.0.0.1. It is now made once per state folder."""
    state = tmp_path / "state"
    first = load({"REGAUGE_STATE_DIR": str(state)}).postgres_password
    kept = state / "secrets" / "postgres"
    assert first == kept.read_text() and len(first) >= 32
    assert kept.stat().st_mode & 0o777 == 0o600
    assert load({"REGAUGE_STATE_DIR": str(state)}).postgres_password == first
    other = load({"REGAUGE_STATE_DIR": str(tmp_path / "other")}).postgres_password
    assert other != first
    # One given wins, and then none is made.
    given = load({"REGAUGE_STATE_DIR": str(tmp_path / "given"), "REGAUGE_POSTGRES_PASSWORD": "pw"})
    assert given.postgres_password == "pw"
    assert not (tmp_path / "given" / "secrets" / "postgres").exists()


def test_local_kafka_clients_log_in_by_scram_with_a_kept_password(tmp_path):
    """Issue 68, A.5: the local broker takes no client that has not logged in."""
    state = tmp_path / "state"
    s = load({"REGAUGE_STATE_DIR": str(state)})
    assert (s.kafka_security_protocol, s.kafka_sasl_mechanism, s.kafka_sasl_username) == (
        "SASL_PLAINTEXT",
        "SCRAM-SHA-512",
        "regauge",
    )
    assert s.kafka_sasl_password == (state / "secrets" / "kafka").read_text()
    # A Kafka of one's own without SASL drops the local login; a cluster's brokers
    # say for themselves how they are secured.
    own = load({"REGAUGE_STATE_DIR": str(state), "REGAUGE_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT"})
    assert (own.kafka_sasl_mechanism, own.kafka_sasl_username, own.kafka_sasl_password) == (
        None,
        None,
        None,
    )
    cluster = load({**CLUSTER_ENV, "REGAUGE_STATE_DIR": str(state)})
    assert cluster.kafka_security_protocol == "PLAINTEXT" and cluster.kafka_sasl_mechanism is None


def test_delta_rs_reads_an_s3a_lake_with_the_object_store_s_endpoint_and_keys():
    local = load({})
    path = f"{local.lake_root}/silver/shop_events"
    assert local.delta_rs(path) == (path, {})
    cluster = load(
        {
            **CLUSTER_ENV,
            "REGAUGE_S3_ENDPOINT": "http://127.0.0.1:9000",
            "REGAUGE_S3_ACCESS_KEY": "regauge",
            "REGAUGE_S3_SECRET_KEY": "s3cret",
        }
    )
    assert cluster.delta_rs("s3a://lake/regauge/silver/shop_events") == (
        "s3a://lake/regauge/silver/shop_events",
        {
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "regauge",
            "AWS_SECRET_ACCESS_KEY": "s3cret",
        },
    )
    # AWS's own endpoint, over HTTPS, with the keys of the environment (delta-rs's own).
    assert load(CLUSTER_ENV).delta_rs("s3a://lake/x") == (
        "s3a://lake/x",
        {"AWS_REGION": "us-east-1"},
    )
