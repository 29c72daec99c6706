{#- The grain test for a composite key, without pulling in a package at run time
    (packages come from GitHub or hub.getdbt.com, which this project cannot reach). -#}
{% test unique_combination_of_columns(model, columns) %}

select {{ columns | join(', ') }}, count(*) as n
from {{ model }}
group by {{ columns | join(', ') }}
having count(*) > 1

{% endtest %}
