{{
    config(
        materialized='incremental',
        incremental_strategy='merge',
        unique_key='order_key',
        on_schema_change='fail'
    )
}}

with

orders as (

    select * from {{ ref('int_orders__with_status') }}

),

final as (

    select
        order_key,
        order_id,
        customer_id,
        currency,
        item_count,
        cast(order_total as decimal(18, 2)) as order_total,
        cast(amount_paid as decimal(18, 2)) as amount_paid,
        cast(case when is_cancelled then order_total else 0 end as decimal(18, 2))
            as cancelled_total,
        is_paid,
        is_cancelled,
        placed_at,
        to_date(placed_at) as placed_date,
        paid_at,
        cancelled_at

    from orders

)

{% if is_incremental() %}

-- A payment or cancellation may arrive any time after its order, so every order
-- is recomputed; only new orders and orders whose status changed are merged,
-- and a rerun on unchanged silver merges nothing.
, changed as (

    select final.*
    from final
    left anti join {{ this }} as current
        on final.order_key = current.order_key
        and final.is_paid <=> current.is_paid
        and final.is_cancelled <=> current.is_cancelled
        and final.amount_paid <=> current.amount_paid
        and final.paid_at <=> current.paid_at
        and final.cancelled_at <=> current.cancelled_at

)

select * from changed

{% else %}

select * from final

{% endif %}
