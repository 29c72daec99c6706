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

order_facts as (

    select
        order_key,
        order_id,
        customer_id,
        currency,
        item_count,
        cast(order_total as decimal(18, 2)) as order_total,
        cast(amount_paid as decimal(18, 2)) as amount_paid,
        cast(
            case when is_cancelled then order_total else 0 end as decimal(18, 2)
        ) as cancelled_total,
        is_paid,
        is_cancelled,
        placed_at,
        to_date(placed_at) as placed_date,
        paid_at,
        cancelled_at

    from orders

),

-- A payment or cancellation may arrive any time after its order, so every order
-- is recomputed; on an incremental run only new orders and orders whose status
-- changed are merged, and a rerun on unchanged silver merges nothing.
final as (

    select order_facts.*

    from order_facts
    {% if is_incremental() %}
    left anti join {{ this }} as previous
        on order_facts.order_key = previous.order_key
        and order_facts.is_paid <=> previous.is_paid
        and order_facts.is_cancelled <=> previous.is_cancelled
        and order_facts.amount_paid <=> previous.amount_paid
        and order_facts.paid_at <=> previous.paid_at
        and order_facts.cancelled_at <=> previous.cancelled_at
    {% endif %}

)

select * from final
