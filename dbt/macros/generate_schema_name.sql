{#- Models go to exactly the schema they name (staging, marts), not <target>_<schema>:
    Trino publishes marts as lakehouse.marts.<model>. -#}
{% macro generate_schema_name(custom_schema_name, node) -%}
    {{ (custom_schema_name or target.schema) | trim }}
{%- endmacro %}
