with

events as (

    select * from {{ source('shop', 'shop_events') }}

),

orders as (

    select * from {{ ref('fct_orders') }}

),

activity as (

    select
        customer_id,
        min(event_time) as first_seen_at,
        max(event_time) as last_seen_at,
        count(*) as events

    from events
    group by customer_id

),

ordering as (

    select
        customer_id,
        count(*) as orders,
        count_if(is_cancelled) as orders_cancelled,
        min(placed_at) as first_order_at

    from orders
    group by customer_id

),

final as (

    select
        activity.customer_id,
        activity.first_seen_at,
        activity.last_seen_at,
        activity.events,
        coalesce(ordering.orders, 0) as orders,
        coalesce(ordering.orders_cancelled, 0) as orders_cancelled,
        ordering.first_order_at

    from activity
    left join ordering on activity.customer_id = ordering.customer_id

)

select * from final
